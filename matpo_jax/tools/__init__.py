"""The agents' tools: HTTP clients for search / open (Serper, Search-R1 retrieval, page services,
real web pages) that never raise into a rollout and never outlive their deadline, the local BM25
search service, and the tool schemas."""
from matpo_jax.tools.clients import (HttpPolicy, PageReader, RetrievalSearch, SerperSearch, ToolBox,
                                     ToolMetrics, ToolResult, worker_toolbox)
from matpo_jax.tools.results import counts_since
from matpo_jax.tools.schemas import OPEN_SCHEMA, SEARCH_SCHEMA, SUBAGENT_SCHEMA
