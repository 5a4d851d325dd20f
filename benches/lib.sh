# Shared by benches/proxy.sh and benches/write_cpu.sh (sourced, not run).

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'; }

wait_port() { for _ in $(seq 1 100); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.1; done; echo "port $1 did not open" >&2; exit 1; }

# start_origin DIR PORT: a fixed-answer origin (nginx `return`, one worker) that answers a
# Chroma add (201 {}), count (200 4) and anything else (200 {}); its pid file is DIR/origin.pid.
start_origin() {
  local dir=$1 port=$2
  mkdir -p "$dir/logs"
  cat > "$dir/origin.conf" <<EOC
worker_processes 1;
pid $dir/origin.pid;
error_log $dir/logs/origin.err warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $dir/cbt; proxy_temp_path $dir/pt; fastcgi_temp_path $dir/ft; uwsgi_temp_path $dir/ut; scgi_temp_path $dir/st;
  keepalive_requests 1000000;
  server {
    listen 127.0.0.1:$port;
    default_type application/json;
    location ~ /add\$ { client_body_buffer_size 64k; return 201 '{}'; }
    location ~ /count\$ { return 200 '4'; }
    location / { return 200 '{}'; }
  }
}
EOC
  nginx -c "$dir/origin.conf" -p "$dir"
}

# write_add_lua FILE: a wrk script posting one-record Chroma adds (a 384-dimension embedding, a
# unique id per request: every request is a new record to judge).
write_add_lua() {
  cat > "$1" <<'EOL'
local n = 0
local emb = "[" .. string.rep("0.0123,", 383) .. "0.0123]"
request = function()
  n = n + 1
  local id = string.format("t%d-%d", math.random(1, 1000000000), n)
  local body = '{"ids":["' .. id .. '"],"embeddings":[' .. emb .. '],"metadatas":[{"source":"bench","n":' .. n ..
    '}],"documents":["Invoices are sent on the first business day of each month as PDF attachments."],"uris":null}'
  return wrk.format("POST", wrk.path, {["Content-Type"] = "application/json"}, body)
end
EOL
}

# gate_config FILE API PROXY METRICS ORIGIN DB: the benchmarked gate (one proxy thread, SQLite,
# the Chroma pack, the default policy).
gate_config() {
  cat > "$1" <<EOC
[service]
watch = false
[listeners]
api = "127.0.0.1:$2"
proxy = "127.0.0.1:$3"
metrics = "127.0.0.1:$4"
proxy_threads = 1
[storage]
url = "sqlite://$6"
[logging]
level = "warn"
format = "text"
[upstream]
address = "127.0.0.1:$5"
[proxy]
packs = ["$PWD/filters/chroma.toml"]
tenant = "00000000-0000-4000-8000-000000000001"
[[tenants]]
id = "00000000-0000-4000-8000-000000000001"
name = "bench"
policy = "default"
EOC
}
