"""Data preparation for nanofp4: the offline GPT-2 tokenizer and corpus tokenization."""
