"""The client: API calls (api, over transport), the kinds we read, and the watch cache (informers)."""
