"""fairq's integrations with other frameworks, one subpackage each."""
