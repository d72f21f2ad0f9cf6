"""Weight-update transports: trainer (HF-named full tensors) -> running SGLang servers, in place."""
