"""Local rendering: chat templates and the bundled prompts."""
