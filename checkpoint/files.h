/*
 * files.h — the file-system steps that make checkpoints atomic: full writes that report errors
 * instead of exiting (the writer runs in a background thread), fsync of files and directories,
 * write-aside-then-rename, recursive removal, and listing the step directories.
 */
#pragma once
#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>
#include <algorithm>
#include <string>
#include <vector>
#include "../model/common.h"

// the errno text of the last failed call, prefixed with what failed
static inline std::string sys_err(const std::string& what) { return what + ": " + strerror(errno); }

// writes all of buf at the file's position; "" or the error
static inline std::string write_all(int fd, const void* buf, size_t n, const std::string& path) {
    const char* p = (const char*)buf;
    while (n > 0) {
        ssize_t w = write(fd, p, n > ((size_t)1 << 30) ? ((size_t)1 << 30) : n);
        if (w < 0) { if (errno == EINTR) continue; return sys_err("write " + path); }
        p += w; n -= (size_t)w;
    }
    return "";
}
static inline std::string pwrite_all(int fd, const void* buf, size_t n, uint64_t off, const std::string& path) {
    const char* p = (const char*)buf;
    while (n > 0) {
        ssize_t w = pwrite(fd, p, n > ((size_t)1 << 30) ? ((size_t)1 << 30) : n, (off_t)off);
        if (w < 0) { if (errno == EINTR) continue; return sys_err("write " + path); }
        p += w; n -= (size_t)w; off += (uint64_t)w;
    }
    return "";
}
// reads exactly n bytes at off; "" or the error (a short file is an error naming how much was there)
static inline std::string pread_all(int fd, void* buf, size_t n, uint64_t off, const std::string& path) {
    char* p = (char*)buf;
    size_t want = n;
    while (n > 0) {
        ssize_t r = pread(fd, p, n > ((size_t)1 << 30) ? ((size_t)1 << 30) : n, (off_t)off);
        if (r < 0) { if (errno == EINTR) continue; return sys_err("read " + path); }
        if (r == 0) return path + ": truncated (wanted " + std::to_string(want) + " bytes at offset " +
                           std::to_string(off - (want - n)) + ", the file ends after " + std::to_string(want - n) + ")";
        p += r; n -= (size_t)r; off += (uint64_t)r;
    }
    return "";
}

static inline std::string fsync_path(const std::string& path) {
    int fd = open(path.c_str(), O_RDONLY);
    if (fd < 0) return sys_err("open " + path + " for fsync");
    int rc = fsync(fd);
    std::string err = rc != 0 ? sys_err("fsync " + path) : "";
    close(fd);
    return err;
}

static inline std::string parent_dir(const std::string& path) {
    size_t s = path.find_last_of('/');
    return s == std::string::npos ? "." : s == 0 ? "/" : path.substr(0, s);
}

static inline std::string mkdir_p(const std::string& path) {
    std::string cur;
    for (size_t i = 0; i <= path.size(); i++) {
        if (i == path.size() || path[i] == '/') {
            if (!cur.empty() && mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST) return sys_err("mkdir " + cur);
        }
        if (i < path.size()) cur.push_back(path[i]);
    }
    return "";
}

static inline bool path_exists(const std::string& path) { struct stat st; return stat(path.c_str(), &st) == 0; }

static inline int rm_rf_one(const char* p, const struct stat*, int type, struct FTW*) {
    return type == FTW_DP ? rmdir(p) : unlink(p);
}
// removes a file or a directory tree; "" or the error
static inline std::string rm_rf(const std::string& path) {
    if (!path_exists(path)) return "";
    if (nftw(path.c_str(), rm_rf_one, 16, FTW_DEPTH | FTW_PHYS) != 0) return sys_err("remove " + path);
    return "";
}

// content -> path, atomically: path.tmp written and fsynced, renamed over path, the directory fsynced
static inline std::string write_file_atomic(const std::string& path, const std::string& content) {
    std::string tmp = path + ".tmp";
    int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return sys_err("create " + tmp);
    std::string err = write_all(fd, content.data(), content.size(), tmp);
    if (err.empty() && fsync(fd) != 0) err = sys_err("fsync " + tmp);
    if (close(fd) != 0 && err.empty()) err = sys_err("close " + tmp);
    if (err.empty() && rename(tmp.c_str(), path.c_str()) != 0) err = sys_err("rename " + tmp);
    if (err.empty()) err = fsync_path(parent_dir(path));
    if (!err.empty()) unlink(tmp.c_str());
    return err;
}

// whole file -> *out; "" or the error
static inline std::string read_file(const std::string& path, std::string* out) {
    int fd = open(path.c_str(), O_RDONLY);
    if (fd < 0) return sys_err("open " + path);
    struct stat st;
    if (fstat(fd, &st) != 0) { close(fd); return sys_err("stat " + path); }
    out->resize((size_t)st.st_size);
    std::string err = pread_all(fd, &(*out)[0], out->size(), 0, path);
    close(fd);
    return err;
}

// the directories "<prefix><digits>" in dir, as (number, name), newest (largest number) first
static inline std::vector<std::pair<long long, std::string>> list_numbered_dirs(const std::string& dir, const char* prefix) {
    std::vector<std::pair<long long, std::string>> out;
    DIR* d = opendir(dir.c_str());
    if (!d) return out;
    size_t pl = strlen(prefix);
    while (struct dirent* e = readdir(d)) {
        const char* n = e->d_name;
        if (strncmp(n, prefix, pl) != 0 || !n[pl]) continue;
        bool digits = true;
        for (const char* c = n + pl; *c; c++) digits = digits && *c >= '0' && *c <= '9';
        if (!digits) continue;
        std::string full = dir + "/" + n;
        struct stat st;
        if (stat(full.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) out.push_back({atoll(n + pl), n});
    }
    closedir(d);
    std::sort(out.begin(), out.end(), [](const std::pair<long long, std::string>& a, const std::pair<long long, std::string>& b) {
        return a.first > b.first;
    });
    return out;
}
