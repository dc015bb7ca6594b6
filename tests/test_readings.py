"""Real machine readings: what each platform source gives, and that a machine with no user
session and no battery (this kind of box) lets background work run."""

from __future__ import annotations

import os
import stat
import time

import psutil
import pytest

from jobcoord import readings as rd
from jobcoord.errors import InvalidInput
from jobcoord.policy import Policy, Readings, evaluate
from jobcoord.service import parse_readings


def test_real_readings_are_in_range_and_a_heartbeat_accepts_them_as_sent(coord):
    values, sources = rd.current_readings()
    gpus = {"gpus"} if "gpus" in values else set()  # only on a machine NVML sees GPUs on
    assert set(values) == {*rd.READING_KEYS, "memory_available_mb", *gpus}
    assert set(sources) == {*rd.READING_KEYS, "memory_available_mb", "gpus"}
    mem = values["memory_used_pct"]
    assert mem == "unknown" or 0 <= mem <= 100
    assert isinstance(values["memory_available_mb"], int) and values["memory_available_mb"] > 0
    got = coord.heartbeat("w1", roles=["gpu"], readings=values)
    for key in rd.READING_KEYS:  # the gate readings, as the heartbeat parsed them
        value = values[key]
        assert got["readings"][key] == (None if value == "unknown" else value)


def test_memory_reading_is_psutils_percentage():
    value, source = rd.memory_used_pct()
    assert source == "psutil.virtual_memory"
    assert abs(value - psutil.virtual_memory().percent) < 5


def test_no_battery_means_ac_power_and_a_battery_reports_its_plug():
    value, source = rd.on_battery()
    battery = psutil.sensors_battery()
    if battery is None:
        assert (value, source) == (False, "no battery: AC power")
    else:
        assert value is (None if battery.power_plugged is None else not battery.power_plugged)


def test_temperature_is_the_hottest_sane_sensor_or_unknown():
    value, source = rd.temperature_c()
    groups = getattr(psutil, "sensors_temperatures", dict)()
    sensors = [t.current for group in groups.values() for t in group
               if t.current is not None and -50 < t.current < 150]
    if sensors:
        assert abs(value - max(sensors)) < 3
    else:
        assert value is None and source.startswith("unavailable")


def test_terminal_idle_time_comes_from_the_terminal_access_time():
    leader, follower = os.openpty()
    try:
        name = os.ttyname(follower)
        now = time.time()
        os.utime(name, (now - 120, now - 120))
        idle = rd.terminal_idle_s(name, now)
        assert idle is not None and 119 <= idle <= 121
        assert rd.terminal_idle_s(name.removeprefix("/dev/"), now) == pytest.approx(idle, abs=1)
    finally:
        os.close(leader)
        os.close(follower)
    assert rd.terminal_idle_s(":0") is None  # an X display is not a device
    assert rd.terminal_idle_s("pts/no-such-terminal") is None


def _program(directory, name: str, body: str) -> None:
    path = directory / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def test_x11_idle_time_is_read_with_xprintidle_when_a_display_exists(tmp_path):
    _program(tmp_path, "xprintidle", "echo 4321")
    env = {"DISPLAY": ":7", "PATH": str(tmp_path)}
    assert rd.x11_idle_s(env) == (4.321, "xprintidle")
    assert rd.x11_idle_s({"PATH": str(tmp_path)}) == (None, "no X11 display")
    assert rd.x11_idle_s({"DISPLAY": ":7", "PATH": str(tmp_path / "none")})[0] is None
    _program(tmp_path, "xprintidle", "echo 'cannot open display' >&2; exit 1")
    value, why = rd.x11_idle_s(env)
    assert value is None and "exit 1" in why


def test_x11_activity_wins_over_an_older_idle_source(tmp_path):
    _program(tmp_path, "xprintidle", "echo 2500")
    value, source = rd.user_idle_s({"DISPLAY": ":7", "PATH": str(tmp_path)})
    assert source == "xprintidle" and value <= 2.5


def test_no_interactive_session_means_idle_since_boot_and_background_work_runs():
    if psutil.users() or psutil.sensors_battery() is not None:
        pytest.skip("this machine has a user session or a battery")
    value, source = rd.user_idle_s({"PATH": os.environ.get("PATH", "")})
    assert source == "no interactive session: idle since boot"
    assert abs(value - (time.time() - psutil.boot_time())) < 5
    values, _ = rd.current_readings(env={"PATH": ""})
    _, parsed = parse_readings(values)
    if parsed.memory_used_pct is not None and parsed.memory_used_pct > 85:
        pytest.skip("this machine is short of memory right now")
    gate = evaluate(Policy(), parsed)
    if value < Policy().background_min_idle_s:
        # Booted moments ago: idle since boot is still shorter than the background rule asks.
        assert gate.refusal is not None and gate.refusal[0] == "user_active"
    else:
        assert gate.max_priority == 3 and gate.refusal is None


def test_unknown_readings_do_not_block_background_work_by_default():
    values = rd.MachineReadings().as_heartbeat()
    assert values == dict.fromkeys((*rd.READING_KEYS, "memory_available_mb"), "unknown")
    _, parsed = parse_readings(values)
    assert parsed == Readings()
    assert evaluate(Policy(), parsed).max_priority == 3
    strict = evaluate(Policy(unknown_blocks_background=True), parsed)
    assert strict.max_priority == 1 and strict.refusal[0] == "power_gate"


def test_override_replaces_only_the_readings_it_names_and_says_so():
    values, sources = rd.current_readings({"memory_used_pct": 92})
    assert values["memory_used_pct"] == 92 and sources["memory_used_pct"] == "override"
    assert sources["on_battery"] != "override"


@pytest.mark.parametrize("text, needle", [
    ("{", "not valid JSON"), ("[1]", "JSON object"), ('{"gpu_pct": 5}', "unknown reading"),
])
def test_bad_override_is_refused_with_a_clear_message(text, needle):
    with pytest.raises(InvalidInput, match=needle):
        rd.parse_override(text)
