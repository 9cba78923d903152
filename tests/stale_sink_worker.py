"""An engine process frozen (SIGSTOP) in the middle of a sink call, for test_stale_sink_call.py.

``python -m tests.stale_sink_worker STORE BACKEND GO_FILE`` opens an engine
on a PostgreSQL STORE under the owner name ``frozen``, with a retain sink
that writes to the table ``sink_episodes`` of the same schema (a sink every
process shares, as a real long-term memory is). It adds one episode to the
session ``s``; its sink call prints ``{"op": "entered"}``, then waits for
GO_FILE to exist (the test freezes the process meanwhile), then, after one
more checkpoint (as a request to a remote sink would have), writes the batch
and prints ``{"op": "wrote"}``; if the call is cancelled, it prints
``{"op": "cancelled"}`` instead. The process then waits to be killed.
"""

from __future__ import annotations

import json
import sys

import anyio
import anyio.lowlevel
import psycopg

from memengine import Episode, SessionConfig, open_engine

CONFIG = SessionConfig(retain_every=1, passivate_after=None)
#: The table the shared sink writes (create it in the store's schema before the engines start).
SINK_TABLE = "CREATE TABLE sink_episodes (session_id text, seq integer, content text, PRIMARY KEY (session_id, seq))"


def emit(op: str) -> None:
    print(json.dumps({"op": op}), flush=True)


class SharedTableSink:
    """Long-term memory as a table every process writes: ``sink_episodes (session_id, seq, content)``.

    The README's DictSink, shared: a retain stores each episode under its (session, seq), a forget
    removes the seqs named (all of the session's for ``seqs=None``). The table needs a primary key
    on (session_id, seq): see :data:`SINK_TABLE`.
    """

    mode = "append"

    def __init__(self, url: str, go_file: str | None = None) -> None:
        self.url = url
        self.go_file = go_file

    async def retain(self, batch) -> None:
        if self.go_file is not None:
            emit("entered")
            try:
                while not await anyio.Path(self.go_file).exists():  # noqa: ASYNC110 - a file another process makes
                    await anyio.sleep(0.05)
                await anyio.lowlevel.checkpoint()  # the request on its way: a checkpoint before it lands
            except BaseException:
                emit("cancelled")
                raise
        with psycopg.connect(self.url, autocommit=True) as conn:
            for episode in batch.episodes:
                conn.execute(
                    "INSERT INTO sink_episodes (session_id, seq, content) VALUES (%s, %s, %s) "
                    "ON CONFLICT (session_id, seq) DO UPDATE SET content = excluded.content",
                    (batch.session_id, episode.seq, episode.content),
                )
        if self.go_file is not None:
            emit("wrote")

    async def forget(self, request) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            if request.seqs is None:
                conn.execute("DELETE FROM sink_episodes WHERE session_id = %s", (request.session_id,))
            else:
                conn.execute(
                    "DELETE FROM sink_episodes WHERE session_id = %s AND seq = ANY(%s)",
                    (request.session_id, list(request.seqs)),
                )


async def main(store: str, go_file: str) -> None:
    async with open_engine(store, retain_sink=SharedTableSink(store, go_file), config=CONFIG, owner="frozen") as engine:
        await engine.session("s").add([Episode("user", "the episode to be deleted")])
        await anyio.sleep_forever()


if __name__ == "__main__":
    store_arg, backend, go_arg = sys.argv[1:4]
    anyio.run(main, store_arg, go_arg, backend=backend)
