-- wrk script: POST a JSON body with a bearer token (from the environment).
wrk.method = "POST"
wrk.body = os.getenv("BODY") or '{"name":"bench"}'
wrk.headers["Content-Type"] = os.getenv("CONTENT_TYPE") or "application/json"
local token = os.getenv("TOKEN")
if token and token ~= "" then
  wrk.headers["Authorization"] = "Bearer " .. token
end
