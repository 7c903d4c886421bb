"""`python -m bailing_knowledge.client`: run the MCP server (see `mcp_server.main`)."""

from .mcp_server import main

if __name__ == "__main__":
    main()
