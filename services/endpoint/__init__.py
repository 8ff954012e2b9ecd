"""Model endpoints as the services reach them: the one OpenAI-compatible client (``client``), the egress guard that
keeps user-given URLs off internal addresses (``netguard``), and cutting an API key out of what an endpoint sent
back (``redaction``)."""
