#pragma once
// OpenAI-shaped errors as the proxy writes them: {"error": {"message", "type", "param",
// "code"}} for whole responses, and the same object as one Server-Sent Event for a stream
// that already began.

#include <string>
#include <string_view>

namespace crescent::proxy {

// The body of an error response. `code` is the HTTP status, as vLLM writes it.
std::string error_body(int http_status, std::string_view message, std::string_view type);

// The error type OpenAI clients expect for a status: invalid_request_error (4xx),
// authentication_error (401), not_found_error (404), service_unavailable (503), timeout (504),
// upstream_error (other 5xx).
std::string_view error_type_for(int http_status);

// `data: {"error": {...}}` and `data: [DONE]`, each ending an event: how a stream that already
// began reports a failure.
std::string sse_error_events(int http_status, std::string_view message);

// True when body is a JSON object with an "error" object: an upstream error that can be
// passed to the client unchanged.
bool is_openai_error(std::string_view body);

// What an upstream's error body says: error.message of an OpenAI error (or FastAPI's
// "detail"), else the start of the text; "(empty body)" for none.
std::string upstream_error_message(const std::string& body);

}  // namespace crescent::proxy
