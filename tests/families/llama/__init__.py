"""The Llama family: every Llama test."""
