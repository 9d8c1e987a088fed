"""``gpuslate sim serve``: a simulated OpenAI-compatible inference server.

It stands in for SGLang/vLLM where there are no GPUs: :mod:`.server` (HTTP,
process), :mod:`.openai_api` (wire formats), :mod:`.scheduler` (continuous
batching), :mod:`.perfmodel` (step times), :mod:`.serverconfig` (flags).
It sits above the benchmark client that measures it and needs nothing of
gpuslate's GPU machinery. The simulated *GPUs* (``sim init/hold/leak``, the
``sim`` backend) are a GPU backend and live below, in :mod:`gpuslate.gpu.simhost`.
"""
