"""Built-in generator plugins: transformers' generate loop (hf, and
hf_turns for environment episodes) and vLLM (vllm).
"""
