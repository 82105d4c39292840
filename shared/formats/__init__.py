"""Public checkpoint formats: reading Hugging Face folders, hub names and GGUF files, and
converting them into this project's checkpoints (``shared.formats.importer``)."""
