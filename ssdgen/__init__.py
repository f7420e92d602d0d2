"""ssdgen: batch image generation with speculative decoders for AR image transformers. The command line is
ssdgen/cli.py; README.md says what is where."""
