"""A process that forgets a tenant, to be killed in the middle (see test_tenant_forget_large.py).

``python -m tests.tenant_forget_worker STORE TENANT BACKEND`` opens an engine on
STORE, prints ``forgetting`` and forgets the sessions ``TENANT/...``, then
prints ``forgot N``.
"""

from __future__ import annotations

import sys

import anyio

from memengine import open_engine


async def main(store: str, tenant: str) -> None:
    async with open_engine(store, resume_pending_summaries=False) as engine:
        print("forgetting", flush=True)
        report = await engine.forget(tenant=tenant)
        print(f"forgot {report.sessions}", flush=True)


if __name__ == "__main__":
    store_arg, tenant_arg, backend = sys.argv[1:4]
    anyio.run(main, store_arg, tenant_arg, backend=backend)
