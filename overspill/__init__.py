"""The public Python namespace of Overspill: `overspill.client` is the API client (see overspill/client.py)."""
