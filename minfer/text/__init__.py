"""Text and tokens: the tokenizer from GGUF metadata (llama.cpp's ids) and the chat templates."""
