"""The ggml family: llama.cpp (llama-cpp-python), its GGUF file and the taps read from its graph."""
