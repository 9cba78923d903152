"""The exit statuses of the ``memengine`` command, in one place; ``memengine --help`` lists them.

Similar failures share a status, whichever command meets them, so a script
can tell "fix the command line" from "the store is not there (yet)" from
"the command ran and the answer is no".
"""

from __future__ import annotations

#: The command did what was asked.
OK = 0
#: The command ran and its outcome is a failure: an unknown session, a replay that differs from its log.
FAILED = 1
#: The command line is wrong: an unknown option, a bad value, a file that must (not) exist, a missing extra.
USAGE = 2
#: The store cannot be opened or used: no such file, not a memengine store (no memengine tables), a server
#: that cannot be reached, a schema that does not exist, a role without rights, a URL of another database.
STORE_UNUSABLE = 3
#: Interrupted (Ctrl-C), as shells report SIGINT.
INTERRUPTED = 130

EPILOG = f"""exit status:
  {OK}    done
  {FAILED}    the command ran and its outcome is a failure (an unknown session, a replay that differs)
  {USAGE}    the command line is wrong (an unknown option, a bad value, a file that must or must not exist)
  {STORE_UNUSABLE}    the store cannot be opened or used (no such file, no memengine tables, server unreachable,
       no such schema, permission denied, a URL of another database)
  {INTERRUPTED}  interrupted (Ctrl-C)

Errors are one line on stderr, never a traceback; a URL is shown with its password as ***."""
