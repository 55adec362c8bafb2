"""taps' redistribution steps as frameworks run them, on a device's local block: what each kind of
step communicates, whichever engine runs it (:mod:`.kinds`: its collective, device dims and groups
of ranks), and the two executors, JAX collectives under ``shard_map`` (:mod:`.jax`, which the XLA
verifier replays) and PyTorch functional collectives (:mod:`.torch`, which
:func:`taps.export.distribute_module` replays)."""
