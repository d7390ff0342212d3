"""The ``zeus-callbacks`` command: :func:`main` and one module per subcommand.

Subcommands:
    validate-config FILE   check a YAML configuration; exit 1 with the errors if invalid
    report RUN.jsonl ...   print a run's energy, time, power limit and per-epoch breakdown; several runs
                           side by side; ``--csv DIR`` writes their records as CSV
    restore                put back the power limits a killed run left changed (its marker file)
    simulate ...           replay a recurring job on the Zeus traces (see ``zeus-callbacks simulate -h``)
    show STORE             jobs, arms (posterior and measured cost), trials and profiles of a store
    plot run RUN.jsonl | plot power-limit RUN.jsonl | plot bandit STORE JOB | plot profile PROFILE.json
                           a run's power and energy per step, the power-limit frontier with the chosen
                           point, the bandit's history, or a fine-grain power profile
                           (``profile-kernel --json``), to PNG
    profile-kernel         fine-grain energy per execution of a demo kernel or ``module:function``
    store copy SRC DST     copy a store's records into a new store (SQLite, JSON or a database)

:mod:`._main` builds the parser and is the one place user errors become exit status 1; each subcommand's
module (``_cmd_*.py``) has an ``add_parser(subparsers)`` for its options and a ``run(args)`` returning the
exit status. :mod:`._compare` puts several runs side by side and writes their records as CSV.
"""

from zeus_callbacks.cli._main import build_parser, main

__all__ = ["build_parser", "main"]
