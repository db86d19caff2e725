"""Training of the tiny Qwen3-Next (target + MTP layer) whose weights live in models/tiny-qwen3next-trained."""
