"""tandem_bench: an open-loop load generator for Tandem (and any OpenAI-compatible server).

`tandem bench ARGS...` runs `python -m tandem_bench ARGS...`; docs/bench.md describes the flags,
the figures and the output files.

Modules:
  arrivals  when requests are sent: Poisson, Gamma (burstiness) or constant gaps, seeded
  workload  what is sent: prompt and output lengths, datasets, shared prefixes, tenants, SLO classes
  clients   how it is sent: OpenAI HTTP (SSE streaming) and tandem.v1.Inference/Generate (gRPC)
  runner    the open-loop driver: one rate's schedule, the concurrency cap, the progress bar
  metrics   percentiles, throughput, SLO attainment and both kinds of goodput
  cluster   a local cluster started with `tandem up`, and its workers' Prometheus counters
  plots     PNG figures (latency CDFs, attainment and percentiles versus rate)
  report    the tables printed at the end, A/B side by side
  cli       flags and the whole run
  argtypes  argparse types for numbers, shared with sim, plan and profile
"""
