"""End-to-end evaluation: every compressor inside a real model through Hugging Face transformers,
beside NVIDIA kvpress's presses, on perplexity, passkey retrieval and line retrieval at equal memory."""
