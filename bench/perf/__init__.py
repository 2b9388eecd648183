"""perf_analyzer-like benchmarking: load generator, floor/peer servers, scenarios, reports.

- :mod:`bench.perf.loadgen`: closed-loop concurrency sweeps and open-loop request rates over
  raw HTTP/1.1 (JSON or the binary tensor extension) or gRPC, JSON results;
- :mod:`bench.perf.report`: a Markdown table and a PNG plot from those results;
- :mod:`bench.perf.servers`: start and stop Naiad, the floor server, MLServer and KServe;
- :mod:`bench.perf.models`: the benchmark model repository (tiny, digits, digits_cnn);
- :mod:`bench.scenarios`: one command per scenario (overhead, throughput, peers, ...).
"""
