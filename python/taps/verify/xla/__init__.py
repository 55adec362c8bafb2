"""The XLA engine: a plan run on simulated CPU devices (:mod:`.devices`), its graph as JAX code
(:mod:`.operators`, :mod:`.program`) replayed under ``shard_map`` by taps' own steps
(:mod:`.replay`; the training step with taps' backward plans in :mod:`.training`; in a fresh
process when JAX started with too few devices, :mod:`.fresh`), or given to XLA's own partitioner
(:mod:`.gspmd`), and every compiled collective read from the optimized HLO (:mod:`.hlo`)."""
