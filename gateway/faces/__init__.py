"""Other APIs' shapes (Anthropic's Messages, OpenAI's Responses) served through the chat-completions path."""
