"""Request control: everything between a parsed request and a routing decision."""
