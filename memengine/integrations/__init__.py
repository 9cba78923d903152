"""Adapters that make memengine the memory of an agent framework.

One module per framework, each installed with an extra of its own (for example
``pip install 'agent-memengine[agents]'`` for :mod:`memengine.integrations.openai_agents`).
Nothing here is imported by ``import memengine``: a framework is imported only
by the module that adapts it.
"""
