"""The driver-side ResourceManager: its transport-free core (``resource_manager``), its gRPC server
(``server``), when a timeout may be acted on (``trust``) and the operators' client (``admin``)."""
