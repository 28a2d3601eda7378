"""The read side: API objects -> the model the core sees (translations, gangs, queues, the world)."""
