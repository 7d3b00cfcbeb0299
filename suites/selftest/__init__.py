"""The suite testing itself (checkout only, not installed)."""
