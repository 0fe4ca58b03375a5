"""The command line: click groups, one module per command family, a thin skin over the library.

Each command imports the library it calls inside its own body: the store pulls alembic and the
reports pull pandas, and `optlab --help`, `optlab diff` or a shell completion should not pay for
them. Everything else imports at module top.
"""
