"""Model adapters: the reference model and Hugging Face AR image models behind the decoders' protocol
(decoders/protocol.py), and the registry that loads one from a `--model` string."""
