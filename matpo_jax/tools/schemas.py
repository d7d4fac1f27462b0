"""The tools as the model sees them: JSON schemas of search, open (workers, single agent) and
subagent (planner), listed in each role's system prompt."""


def _function(name: str, description: str, properties: dict, required: list[str]) -> dict:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }


SEARCH_SCHEMA = _function(
    "search",
    "Search the web. Returns titles, ids and snippets of the best pages.",
    {
        "query": {"type": "string", "description": "search query"},
        "num": {
            "type": "integer",
            "description": "number of results (default 5)",
            "minimum": 1,
            "maximum": 10,
        },
    },
    ["query"],
)
OPEN_SCHEMA = _function(
    "open",
    "Open a page and read its text.",
    {"id": {"type": "string", "description": "a page id or URL from the search results"}},
    ["id"],
)
SUBAGENT_SCHEMA = _function(
    "subagent",
    "Give a sub-task to a worker, who searches and returns a short report.",
    {"subtask": {"type": "string", "description": "the sub-task, stated on its own"}},
    ["subtask"],
)
