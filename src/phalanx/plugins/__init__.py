"""Plugins: one module each, combined by the extension points of `phalanx.core.extension`."""
