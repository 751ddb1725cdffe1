"""The test bed: the tools that prove the daemon, kept apart from the product.

- `emulator`: the bundled ntfy-compatible server, with fault injection;
- `receiver`: the reference triage receiver (verifies signatures, keeps receipts);
- `signal_standin`: a stand-in for signal-cli-rest-api;
- `drill` (with `drill_args`, `drill_report`): kill -9 verification with a verdict;
- `demo`: the zero-setup end-to-end run;
- `commands`: their `ntfy-intake` subcommands, which the CLI registers beside its own.

The test bed may import the product; the product never imports the test bed, except the CLI,
which imports `commands` inside the function that builds its parser (tests/unit/test_layout.py).
"""
