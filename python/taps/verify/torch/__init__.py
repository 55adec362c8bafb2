"""The PyTorch engine: a torch module's plan applied by :func:`taps.export.distribute_module` and
run on DTensor, forward and backward, on the fake process group at the plan's full world size
(:mod:`.engine`), every dispatched collective recorded with the edge or operator it serves
(:mod:`.collectives`), and the numbers checked on a few gloo ranks (:mod:`.numerics`), all from
the same seeded values (:mod:`.values`)."""
