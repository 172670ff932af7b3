# Sourced by setup.sh and run.sh on the GPU host: Docker 26 from /tmp/dk, started if it is not
# answering (a device call's processes end with the call; /tmp/dk/data survives while the machine
# stays warm). The flags are shared/reference/gpu-docker.md section 1's: no bridge (every build
# and container uses --network host), and --userland-proxy=false, which dockerd needs when its
# binaries are not under /usr.
D=/tmp/dk
export PATH=$D/bin:$PATH DOCKER_HOST=unix://$D/docker.sock
start_dockerd() {
    docker version >/dev/null 2>&1 && return 0
    rm -f $D/docker.pid; rm -rf $D/exec; mkdir -p $D/data $D/exec
    echo '{"features": {"cdi": true}, "cdi-spec-dirs": ["/etc/cdi"], "storage-driver": "overlay2"}' > $D/daemon.json
    setsid dockerd --config-file $D/daemon.json --data-root $D/data --exec-root $D/exec -p $D/docker.pid \
        -H unix://$D/docker.sock --iptables=false --ip6tables=false --bridge=none --ip-masq=false \
        --userland-proxy=false >> $D/dockerd.log 2>&1 < /dev/null &
    local i
    for i in $(seq 60); do
        docker version >/dev/null 2>&1 && { echo "dockerd up after ${i}s"; return 0; }
        kill -0 $! 2>/dev/null || break
        sleep 1
    done
    tail -20 $D/dockerd.log; echo "dockerd did not start" >&2; return 3
}
