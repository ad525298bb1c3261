"""Experiments: a spec checked up front, the one harness, a run directory, analyses.

- :mod:`~profkit.experiments.harness` — arms, clusters, the one timed execution,
  interleaving, crash detail (what every timing experiment is built from);
- :mod:`~profkit.experiments.bench` — plain vs EXPLAIN ANALYZE across builds;
- :mod:`~profkit.experiments.timing_accuracy` — clock-source variants per plan node;
- :mod:`~profkit.experiments.observers` — the slowdown each profiler causes;
- :mod:`~profkit.experiments.correction` — TIMING ON corrected for the clock vs plain;
- :mod:`~profkit.experiments.profile` — one backend under perf or gprof, flamegraphs;
- :mod:`~profkit.experiments.flamediff` — two builds recorded again and again, interleaved:
  a differential flamegraph coloured only where a bootstrap interval excludes 0;
- :mod:`~profkit.experiments.probe` — clock reads per query and per plan node (eBPF);
- :mod:`~profkit.experiments.attach` — the same, and perf, on a server profkit did not start;
- :mod:`~profkit.experiments.probe_runs` — the clock-calls and probe runs (target, folder,
  tables, text and JSON);
- :mod:`~profkit.experiments.cell` — one statement under a collector: a ``%%profkit`` cell;
- :mod:`~profkit.experiments.reproduce` — ``profkit reproduce``'s stages.

Every run is written through :mod:`profkit.rundir` and read back by its ``load_run``.
"""
