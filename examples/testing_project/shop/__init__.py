"""A shop whose orders send receipts in the background, one tenant per store front."""
