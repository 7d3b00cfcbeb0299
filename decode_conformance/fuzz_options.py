"""Command-line options of fuzz mode (`--case-set=fuzz`, suites/parity/test_fuzz.py).

The plugin registers them in its option group: `fuzz_options.add_options(group)`. Each has
an environment variable for CI jobs that cannot change the command line.
"""
from __future__ import annotations

import os

DEFAULT_EXAMPLES = 100
DEFAULT_SEED = 0
DEFAULT_SHRINK_SECONDS = 600.0
EXAMPLES_ENV = "DECODE_CONFORMANCE_FUZZ_EXAMPLES"
SEED_ENV = "DECODE_CONFORMANCE_FUZZ_SEED"
DATABASE_ENV = "DECODE_CONFORMANCE_FUZZ_DATABASE"


def default_examples() -> int:
    return int(os.environ.get(EXAMPLES_ENV) or DEFAULT_EXAMPLES)


def default_seed() -> int:
    return int(os.environ.get(SEED_ENV) or DEFAULT_SEED)


def default_database():
    return os.environ.get(DATABASE_ENV) or None


def add_options(group) -> None:
    group.addoption("--fuzz-examples", type=int, default=None, metavar="N",
                    help=f"fuzz mode (--case-set=fuzz): cases drawn per kernel (default ${EXAMPLES_ENV}, else 100)")
    group.addoption("--fuzz-seed", type=int, default=None, metavar="SEED",
                    help=f"fuzz mode: the seed every draw derives from (default ${SEED_ENV}, else 0)")
    group.addoption("--fuzz-database", default=None, metavar="DIR",
                    help=f"fuzz mode: hypothesis example database directory: failures found earlier replay first, "
                         f"while they fail (runs that pass them delete their entries: pin a find with --extra-cases); default "
                         f"${DATABASE_ENV}, else none")
    group.addoption("--fuzz-shrink-seconds", type=float, default=None, metavar="SECONDS",
                    help="fuzz mode: time allowed for shrinking a failure to a minimal case (default 600)")
