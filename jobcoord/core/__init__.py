"""The rules of the job lifecycle, one module per family: submit, claim, fencing, recovery,
admin, queries (and workers, common). Each function takes the open coordinator as its
context and asks the store for operations; none branches on the database."""
