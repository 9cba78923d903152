"""One user's data in one call: export every session of a tenant, or forget (erase) them all."""
