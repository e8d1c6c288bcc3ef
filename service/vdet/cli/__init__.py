"""The `vdet` command line (vdet.cli.main): serve, detect, eval, export, quantize, engine,
generate, bench. Each command parses its arguments and hands over to the package that owns the
work; nothing here computes anything itself."""
