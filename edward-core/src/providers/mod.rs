//! Model providers over HTTP (OpenAI-compatible, Anthropic, Gemini) and the Tavily web search.
