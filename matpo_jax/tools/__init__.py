"""The agents' tools: HTTP clients for search / open (Serper, Search-R1 retrieval, page readers)
that never raise into a rollout, the local BM25 search service, and the tool schemas."""
from matpo_jax.tools.clients import (HttpPolicy, PageReader, RetrievalSearch, SerperSearch, ToolBox,
                                     ToolMetrics, ToolResult, worker_toolbox)
from matpo_jax.tools.schemas import OPEN_SCHEMA, SEARCH_SCHEMA, SUBAGENT_SCHEMA
