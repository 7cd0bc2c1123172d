package api

import _ "embed"

// OpenAPI is the OpenAPI 3 document of this API (openapi.yaml), served at
// PathOpenAPI.
//
//go:embed openapi.yaml
var OpenAPI []byte
