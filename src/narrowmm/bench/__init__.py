"""``narrowmm bench``: the kernel benchmark and the whole-model ones.

- :mod:`.kernels`: the default command, narrowmm against the machine's limits and its peers
  on the Llama shapes (the systems, the cases and the run);
- :mod:`.machine`: cache and memory sizes, the limit probes, BLAS and threads, and how a
  case makes the cache cold within the memory budget (``ColdPlan``);
- :mod:`.timing`: calls timed alone or in turns;
- :mod:`.results`: what a measurement records (the JSON schema); :mod:`.report`: the
  tables, summaries and plot;
- :mod:`.minilm` and :mod:`.llama`: all-MiniLM-L6-v2 sentences/s, greedy decode tokens/s.

docs/bench.md explains the method and the JSON schema.
"""
