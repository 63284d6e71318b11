"""``narrowmm bench``: the kernel benchmark (:mod:`.kernels`: narrowmm against the
machine's limits and its peers on the Llama shapes) and the whole-model ones
(:mod:`.minilm`: all-MiniLM-L6-v2 sentences/s; :mod:`.llama`: greedy decode tokens/s
against llama.cpp and PyTorch). docs/bench.md explains the method and the JSON schema."""
