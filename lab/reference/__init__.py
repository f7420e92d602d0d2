"""The reference model's training (tokenizer, transformer, scorer), its checks and the docs' figures: the lab's
side of ssdgen.reference, which keeps only what a run, `ssdgen eval` and `ssdgen train-heads` use."""
