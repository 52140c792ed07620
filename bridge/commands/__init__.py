"""The ``fencebridge`` commands, one module each.

Each module adds its parser with ``register(commands)`` and sets ``run`` on it to the function
that carries the command out; :mod:`bridge.cli` only wires them. What they share lives in
:mod:`bridge.commands.arguments` (argument types, the database flag, usage errors) and
:mod:`bridge.commands.session` (a store, the identity keys, tables and JSON). A module imports
what only its command needs inside that function, so ``fencebridge --help`` stays fast.
"""
