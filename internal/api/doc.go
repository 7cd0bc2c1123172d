// Package api is the wire contract between the mosto controller and the
// proxies (agents): the JSON types of every request and response, their
// validation, the HTTP handlers of the controller (Server) and a small client
// (Client). openapi.yaml beside this file documents the same API for humans
// and other languages; the types here are the source of truth and a test keeps
// the two in step.
//
// The package owns decoding, validation and HTTP status codes. It owns no
// state: every request is answered by a Backend (the controller) and, for
// /v1/join, a Joiner (the CA in internal/pki). Bad input is always a 4xx with
// a JSON body {"error": "..."}, never a 500.
package api
