"""llama.cpp under the embedded engine: its build, its GGUF files and its server processes."""
